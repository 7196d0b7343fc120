//! Hosts the integration tests in `tests/` (and their helper binary `lock_holder`) and the
//! doctests of the README and the guides.

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
