//! The process default locker, used by `#[distributed_lock]` functions without `locker = ..`.

use std::sync::OnceLock;

use crate::{LockError, Locker};

/// The process default: a locker, or why none could be made from the environment (kept, so
/// that every locked call reports it rather than panicking).
static DEFAULT: OnceLock<Result<Locker, String>> = OnceLock::new();

/// Sets the locker used by `#[distributed_lock]` functions without a `locker = ..` option.
/// Returns the locker back if a default was already set or made.
///
/// In tests, `set_default_locker(Locker::in_memory())` runs those functions without Redis:
/// each test (each tokio runtime) gets locks of its own (see [`Locker::in_memory`]).
///
/// ```
/// use lock_runtime::{Locker, distributed_lock, set_default_locker};
///
/// #[distributed_lock(name = "nightly", ttl = "30s")]
/// async fn nightly() {}
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// set_default_locker(Locker::in_memory()).expect("set once, before the first locked call");
/// nightly().await;
/// # }
/// ```
pub fn set_default_locker(locker: Locker) -> Result<(), Locker> {
    let mut given = Some(locker);
    DEFAULT.get_or_init(|| {
        let locker = given.take().expect("taken once");
        log_made(&locker, "set_default_locker");
        Ok(locker)
    });
    match given {
        Some(locker) => Err(locker),
        None => Ok(()),
    }
}

/// The process default locker: the one given to [`set_default_locker`], else one made on first
/// use from the environment by [`LockerBuilder::from_env`](crate::LockerBuilder::from_env):
/// `LOCK_REDIS_CLUSTER` (a Redis Cluster), else `LOCK_REDIS_SENTINELS` with
/// `LOCK_REDIS_SENTINEL_MASTER` (Sentinel), else `LOCK_REDIS_URL`, then `REDIS_URL` (one server,
/// or Redlock over comma-separated URLs), else `redis://127.0.0.1:6379`; `LOCK_REDIS_REPLICAS`
/// sets `replicas(n)`.
///
/// A malformed variable (a URL that cannot be parsed, say) is a [`LockError::Config`] naming
/// it, returned by this call and by every locked call that uses the default locker.
pub fn default_locker() -> Result<Locker, LockError> {
    let made = DEFAULT.get_or_init(|| {
        let builder = crate::LockerBuilder::from_env().map_err(|e| e.to_string())?;
        let var = crate::LockerBuilder::env_source();
        let locker = builder.build().map_err(|e| {
            format!("cannot make the default locker from {var}: {e}; fix {var} or call set_default_locker")
        })?;
        log_made(&locker, var);
        Ok(locker)
    });
    match made {
        Ok(locker) => Ok(locker.clone()),
        Err(message) => Err(LockError::config("", message.clone())),
    }
}

/// The one event of the default locker: which deployment it uses, and where that came from.
fn log_made(locker: &Locker, from: &str) {
    tracing::info!(
        target: "lock_runtime",
        deployment = locker.described(),
        from,
        "default locker made"
    );
}
