//! The process default locker, used by `#[distributed_lock]` functions without `locker = ..`.

use std::sync::OnceLock;

use crate::{LockError, Locker};

/// The process default: a locker, or why none could be made from the environment (kept, so
/// that every locked call reports it rather than panicking).
static DEFAULT: OnceLock<Result<Locker, String>> = OnceLock::new();

/// Sets the locker used by `#[distributed_lock]` functions without a `locker = ..` option.
/// Returns the locker back if a default was already set or made.
pub fn set_default_locker(locker: Locker) -> Result<(), Locker> {
    let mut given = Some(locker);
    DEFAULT.get_or_init(|| Ok(given.take().expect("taken once")));
    match given {
        Some(locker) => Err(locker),
        None => Ok(()),
    }
}

/// The process default locker: the one given to [`set_default_locker`], else one made on first
/// use from `LOCK_REDIS_URL`, then `REDIS_URL`, then `redis://127.0.0.1:6379`.
///
/// A URL from the environment that cannot be parsed is a [`LockError::Config`] naming the
/// variable, returned by this call and by every locked call that uses the default locker.
pub fn default_locker() -> Result<Locker, LockError> {
    let made = DEFAULT.get_or_init(|| {
        let (var, url) = ["LOCK_REDIS_URL", "REDIS_URL"]
            .into_iter()
            .find_map(|v| std::env::var(v).ok().map(|u| (v, u)))
            .unwrap_or(("the built-in default", "redis://127.0.0.1:6379".to_owned()));
        Locker::builder().url(url).build().map_err(|e| {
            format!("cannot make the default locker from {var}: {e}; fix {var} or call set_default_locker")
        })
    });
    match made {
        Ok(locker) => Ok(locker.clone()),
        Err(message) => Err(LockError::config("", message.clone())),
    }
}
