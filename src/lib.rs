//! Hosts the integration tests in `tests/` and the programs in `examples/`.
