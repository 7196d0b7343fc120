//! How a lock failure becomes the return value of a locked function.
//!
//! The attribute names one of two traits at the user's return type: [`FromLockError`] on the
//! error type of a `Result<T, E>` written as such, [`LockOutput`] on any other return type. Their
//! impls are `do_not_recommend`, so a type that does not fit gets the trait's own message at the
//! user's code, not rustc's account of the impls it tried.

use crate::LockError;

/// A return type the `#[distributed_lock]` attribute can report a [`LockError`] through.
///
/// Implemented for `Result<T, E>` with `E: From<LockError>` (the error is converted) and for `()`
/// (the error is logged through `tracing` and the call returns).
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` cannot return a lock failure as `{Self}`",
    label = "a lock failure cannot be returned as this type",
    note = "a locked function returns `Result<T, E>` where `E: From<lock_runtime::LockError>` \
            (your error enum with a variant that wraps it, `std::io::Error`, \
            `Box<dyn std::error::Error + Send + Sync>`), or `()` to log lock failures and return"
)]
pub trait LockOutput {
    /// The value returned when the lock could not be taken or was lost.
    fn from_lock_error(err: LockError) -> Self;
}

#[diagnostic::do_not_recommend]
impl<T, E: From<LockError>> LockOutput for Result<T, E> {
    fn from_lock_error(err: LockError) -> Self {
        Err(E::from(err))
    }
}

#[diagnostic::do_not_recommend]
impl LockOutput for () {
    fn from_lock_error(err: LockError) {
        match &err {
            // Another node running this job is the normal case for a scheduled job: every
            // replica but one skips each tick.
            LockError::Busy { name, .. } => {
                tracing::debug!(target: "lock_runtime", lock = %name, "skipped: lock is held elsewhere");
            }
            // Logged at WARN by the engine when it happened.
            LockError::Lost { .. } | LockError::MaxExecExceeded { .. } => {
                tracing::debug!(target: "lock_runtime", lock = %err.lock_name(), error = %err, "locked call ended early");
            }
            _ => {
                tracing::warn!(target: "lock_runtime", lock = %err.lock_name(), error = %err, "locked call failed")
            }
        }
    }
}

/// An error type a locked function can return a lock failure as: every `E: From<LockError>`.
///
/// Implemented for all of them; the attribute names it on the `E` of a return type written
/// `Result<T, E>`, so that an `E` without `From<LockError>` is reported there.
#[diagnostic::on_unimplemented(
    message = "`#[distributed_lock]` cannot return a lock failure as `{Self}`: it has no \
               `From<LockError>`",
    label = "this error type has no `From<LockError>`",
    note = "use an error type with `From<lock_runtime::LockError>`: your error enum with a \
            variant that wraps it, `std::io::Error`, `Box<dyn std::error::Error + Send + Sync>`; \
            or return `()` to log lock failures and return"
)]
pub trait FromLockError: Sized {
    /// `Err` of the lock failure, converted.
    fn lock_failure<T>(err: LockError) -> Result<T, Self>;
}

#[diagnostic::do_not_recommend]
impl<E: From<LockError>> FromLockError for E {
    fn lock_failure<T>(err: LockError) -> Result<T, Self> {
        Err(E::from(err))
    }
}
