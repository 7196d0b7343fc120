//! How a lock failure becomes the return value of a locked function.

use crate::LockError;

/// A return type the `#[distributed_lock]` attribute can report a [`LockError`] through.
///
/// Implemented for `Result<T, E>` with `E: From<LockError>` (the error is converted) and for `()`
/// (the error is logged through `tracing` and the call returns).
#[diagnostic::on_unimplemented(
    message = "a `#[distributed_lock]` function must return `Result<T, E>` with `E: From<LockError>`, or `()`; `{Self}` is neither",
    label = "this return type cannot report a lock failure",
    note = "return `Result<T, E>` where `E: From<lock_runtime::LockError>` (anyhow::Error, std::io::Error and your own error enum with a `From` impl work), or `()` to log failures and return"
)]
pub trait LockOutput {
    /// The value returned when the lock could not be taken or was lost.
    fn from_lock_error(err: LockError) -> Self;
}

impl<T, E: From<LockError>> LockOutput for Result<T, E> {
    fn from_lock_error(err: LockError) -> Self {
        Err(E::from(err))
    }
}

impl LockOutput for () {
    fn from_lock_error(err: LockError) {
        match &err {
            // Another node running this job is the normal case for a scheduled job: every
            // replica but one skips each tick.
            LockError::Busy { name, .. } => {
                tracing::debug!(lock = %name, "skipped: lock is held elsewhere");
            }
            // Logged at WARN by the engine when it happened.
            LockError::Lost { .. } | LockError::MaxExecExceeded { .. } => {
                tracing::debug!(lock = %err.lock_name(), error = %err, "locked call ended early");
            }
            _ => tracing::warn!(lock = %err.lock_name(), error = %err, "locked call failed"),
        }
    }
}
