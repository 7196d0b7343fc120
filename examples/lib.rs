//! What the examples share: showing the engine's tracing events.

/// Prints the engine's `tracing` events (acquired, skipped, lost, cancelled, released, with
/// their fences and waits) on standard error when `RUST_LOG` is set, filtered by it
/// (`RUST_LOG=debug`, `RUST_LOG=lock_runtime=trace,info`): without it, an example prints only its
/// own lines.
pub fn show_lock_events() {
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let Ok(spec) = std::env::var("RUST_LOG") else {
        return;
    };
    // `Targets` reads the `target=level` lists people write; anything else shows the engine's
    // own events at `debug` rather than nothing.
    let filter = spec
        .parse::<Targets>()
        .unwrap_or_else(|_| Targets::new().with_target("lock_runtime", tracing::Level::DEBUG));
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_target(false)
        .without_time()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .compact()
        .finish()
        .with(filter)
        .try_init();
}
