//! The one rule for the engine's mutexes: a mutex poisoned by a panic is used as it is.
//!
//! No engine mutex is held across an `.await` or while user code runs; each guards a small
//! record (a schedule, a set of channels, a lease's status) that a critical section updates in a
//! few steps. A panic inside one would be a bug of this crate, and refusing the mutex from then
//! on would turn it into a process whose leases are no longer renewed, released or handed over,
//! and whose waiters are never woken. Reading on is the smaller harm: the lease's own checks
//! (its validity, the server's compare-and-set scripts) still bound what a stale record can do.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locking that takes the guard whether or not the lock was poisoned (see the module).
pub(crate) trait Unpoisoned<T: ?Sized> {
    /// The mutex's guard.
    fn locked(&self) -> MutexGuard<'_, T>;
}

impl<T: ?Sized> Unpoisoned<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// [`Unpoisoned`] for a read-write lock.
pub(crate) trait UnpoisonedRw<T: ?Sized> {
    /// A read guard.
    fn read_now(&self) -> RwLockReadGuard<'_, T>;
    /// A write guard.
    fn write_now(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> UnpoisonedRw<T> for RwLock<T> {
    fn read_now(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_now(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_poisoned_lock_is_used_as_it_is() {
        let shared = Arc::new((Mutex::new(1), RwLock::new(2)));
        let poisoner = Arc::clone(&shared);
        let _ = std::thread::spawn(move || {
            let _m = poisoner.0.lock().unwrap();
            let _w = poisoner.1.write().unwrap();
            panic!("poisons both");
        })
        .join();
        assert!(shared.0.is_poisoned() && shared.1.is_poisoned());
        *shared.0.locked() += 1;
        *shared.1.write_now() += 1;
        assert_eq!((*shared.0.locked(), *shared.1.read_now()), (2, 3));
    }
}
