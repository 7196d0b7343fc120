//! Distributed locks for async Rust on Redis.
//!
//! Write one attribute on an `async fn`:
//!
//! ```no_run
//! use lock_runtime::{distributed_lock, LockError};
//!
//! #[derive(Debug)]
//! enum AppError { Lock(LockError) }
//! impl From<LockError> for AppError {
//!     fn from(e: LockError) -> Self { AppError::Lock(e) }
//! }
//!
//! #[distributed_lock(name = "report:{tenant}", ttl = "30s", wait = "5s", guard = lease)]
//! async fn build_report(tenant: &str) -> Result<u64, AppError> {
//!     // `lease.fence()` grows with every acquisition of this name: hand it to your storage.
//!     Ok(lease.fence())
//! }
//! ```
//!
//! The call acquires `lock:{report:<tenant>}` (waiting up to 5 s in a fair queue, woken by the
//! holder's release), renews it in the background, cancels the body at its deadline or when the
//! lock is lost, and releases it on every return path. The options, the accepted functions and
//! what the expansion does are on [`distributed_lock`]. The same engine is available by hand
//! through [`Locker::acquire`] and [`Locker::run`], with [`LockOptions`]; every failure is a
//! [`LockError`].
//!
//! # Which Redis
//!
//! A function without `locker = ..` uses the process default locker: the one given to
//! [`set_default_locker`], else one made on first use from the environment
//! ([`LockerBuilder::from_env`]):
//!
//! 1. `LOCK_REDIS_CLUSTER`: comma-separated seed URLs of a Redis Cluster;
//! 2. else `LOCK_REDIS_SENTINELS` with `LOCK_REDIS_SENTINEL_MASTER`: the primary those Sentinels
//!    name;
//! 3. else `LOCK_REDIS_URL`, then `REDIS_URL`: one server, or Redlock over comma-separated URLs;
//! 4. else `redis://127.0.0.1:6379`.
//!
//! `LOCK_REDIS_REPLICAS=n` adds [`replicas(n)`](LockerBuilder::replicas). A locker of your own
//! comes from [`Locker::connect`], [`Locker::redlock`] or [`Locker::builder`] (Cluster, Sentinel,
//! key prefix and format, timeouts, TLS with the `tls` feature).
//!
//! # Features
//!
//! - `tls`: `rediss://` URLs.
//! - `metrics`: counters, histograms and gauges through the `metrics` facade.
//!
//! To test your own locked code without Redis, make [`Locker::in_memory`] the default locker:
//! the same engine, in the test process, on tokio's (pausable) clock. The test support for real
//! servers (private `redis-server` processes, Redis Cluster, Sentinel and fault injection) is
//! the `lock-testing` crate.
//!
//! # Guides
//!
//! The repository's `docs/` folder holds the guides, next to its README and CHANGELOG:
//!
//! - `docs/guarantees.md`: what a lock promises, what Redis must not lose (persistence,
//!   failover, eviction), clocks, pauses, and how storage should check a fence;
//! - `docs/deployments.md`: one server, Cluster, Sentinel, `replicas(n)`, Redlock, the key
//!   formats and sharing locks with Python;
//! - `docs/operations.md`: `lockctl`, tracing events, metrics;
//! - `docs/performance.md`: the benchmark, how it measures, the current figures;
//! - `docs/testing.md`: testing your own locked code, without Redis or against private servers.

// The engine's layers, declared from the bottom up. Each folder is one layer and imports only
// layers declared before it, those that the table in `tests/layering.rs` allows (it reads this
// list and enforces the table; docs/architecture.md shows it).

/// Values without I/O: options, errors, key names, holder tokens.
mod model;

/// Async building blocks: request deadlines, fan-out, tracing and metrics.
mod plumbing;

/// How a request reaches one logical server: direct, Redis Cluster, Sentinel.
mod transport;

/// One logical server: the lock's scripts and commands, its release notifications.
mod server;

/// What is known of one hold while it lives.
mod state;

/// The deployment: its servers, and the one place that decides their replies.
mod deployment;

/// A granted hold: its renewal and its handle.
mod hold;

/// Taking a hold: one attempt, the fair queue, waiting.
mod acquire;

/// The facade: `Locker`, locked calls, nested calls, the default locker, inspection.
mod api;

pub use api::builder::{DEFAULT_FENCE_RETENTION, ENV_VARS, LockerBuilder};
pub use api::default_locker::{default_locker, set_default_locker};
pub use api::election::LeaderWatch;
pub use api::inspect::{Holding, LIST_LIMIT, LockInfo, LockState, Waiting};
pub use api::locker::Locker;
pub use hold::lease::Lease;
#[doc = include_str!("api/attribute.md")]
#[doc(inline)]
pub use lock_macros::distributed_lock;
pub use model::error::{LockError, LostReason};
pub use model::holder::Holder;
pub use model::keys::KeyFormat;
pub use model::options::{LockOptions, drift_for};
pub use model::output::{FromLockError, LockOutput};

/// The Redis Cluster hash slot of a key, for `lock-testing`, whose clusters place and move keys
/// by the same function the engine groups renewals by (one copy of it). Not a public API.
#[doc(hidden)]
pub mod __slot {
    pub use crate::transport::slot::{SLOT_COUNT, key_slot};
}

/// Paths named by the code that `#[distributed_lock]` generates. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::model::output::{FromLockError, LockOutput};
    pub use crate::{Lease, LockError, LockOptions, Locker};
    pub use core::time::Duration;

    /// The process default locker (see [`crate::set_default_locker`]), or why there is none.
    pub fn default_locker() -> Result<Locker, LockError> {
        crate::api::default_locker::default_locker()
    }

    /// `opts` for a body without `guard`, which cannot read its lease's fence: an uncontended
    /// acquire skips computing one. For the attribute's expansion only.
    #[must_use]
    pub const fn without_fence(opts: LockOptions) -> LockOptions {
        opts.without_fence()
    }

    /// Clones the locker named by the attribute's `locker = expr` (`&(expr)` must deref to it).
    pub fn locker_ref(locker: &Locker) -> Result<Locker, LockError> {
        Ok(locker.clone())
    }

    /// [`run`] over several names (`name = [..]`): the body gets their leases in the order
    /// written (see [`Locker::run_all`]).
    pub async fn run_all<R, F>(
        locker: Result<Locker, LockError>,
        names: Vec<String>,
        opts: &LockOptions,
        body: F,
        lock_failure: fn(LockError) -> R,
    ) -> R
    where
        F: AsyncFnOnce(&[Lease]) -> R,
    {
        let locker = match locker {
            Ok(locker) => locker,
            Err(err) => {
                return lock_failure(err.for_lock(names.first().map_or("", String::as_str)));
            }
        };
        match locker.run_all(&names, opts, body).await {
            Ok(out) => out,
            Err(err) => lock_failure(err),
        }
    }

    /// The whole life of one locked call, with a lock failure mapped into the body's return type
    /// by `lock_failure` (which the attribute names at the user's return type, so that a type
    /// that cannot carry a lock failure is reported there, and only there).
    pub async fn run<R, F>(
        locker: Result<Locker, LockError>,
        name: String,
        opts: &LockOptions,
        body: F,
        lock_failure: fn(LockError) -> R,
    ) -> R
    where
        F: AsyncFnOnce(&Lease) -> R,
    {
        let locker = match locker {
            Ok(locker) => locker,
            Err(err) => return lock_failure(err.for_lock(&name)),
        };
        match locker.run_owned_name(name, opts, body).await {
            Ok(out) => out,
            Err(err) => lock_failure(err),
        }
    }
}
