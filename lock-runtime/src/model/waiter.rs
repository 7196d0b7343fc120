//! A caller's place in a lock's waiter queue, as each of its attempts states it.

use std::time::Duration;

/// A waiter's identity in the queue, the grace it asks for, and the token of its previous
/// attempt (empty: none), to which a release may have granted the lock.
#[derive(Debug, Clone)]
pub(crate) struct Waiter {
    pub id: String,
    pub grace: Duration,
    pub previous: String,
}
