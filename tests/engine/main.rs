//! The integration tests that share one process: one module per behaviour, each run against
//! private redis-server processes. One binary rather than one per file: the support module and
//! the dependencies are compiled and linked once. Tests that need a process of their own (the
//! process default locker, the metrics recorder, the fault tests that time leases alone, the
//! soaks, the compile-time checks) are binaries of their own beside this one.

#[path = "../support/mod.rs"]
pub mod support;

mod acquire;
mod attribute;
mod attribute_async_trait;
mod attribute_lints;
mod bad_input;
mod behaviour;
mod cancellation;
mod cluster;
mod connection;
mod election;
mod error_hints;
mod eviction;
mod hand_over;
mod history_checker;
mod in_memory;
mod inspect;
mod key_formats;
mod lease;
mod losses;
mod nested_sections;
mod observability;
mod permits;
mod promises;
mod python_interop;
mod redlock;
mod release;
mod renewal;
mod runtimes;
mod sentinel;
mod setup_errors;
mod several;
mod shared;
mod tls;
mod waiting;
