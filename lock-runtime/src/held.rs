//! The locks the current task holds through `run` (and so through the attribute), so that a
//! nested call on one of them runs under the lease already held instead of waiting for itself.
//!
//! Task-local on purpose: another task, even one spawned by the holder, is another holder.

use std::sync::Arc;

use crate::validity::LeaseState;

tokio::task_local! {
    static HELD: Vec<Held>;
}

#[derive(Clone)]
struct Held {
    /// Which locker: an identity its clones share.
    locker: usize,
    lease: Arc<LeaseState>,
}

/// The lease this task holds on `key` through locker `locker`, if any.
pub(crate) fn find(locker: usize, key: &str) -> Option<Arc<LeaseState>> {
    HELD.try_with(|held| {
        held.iter()
            .rev()
            .find(|h| h.locker == locker && h.lease.key == key)
            .map(|h| Arc::clone(&h.lease))
    })
    .ok()
    .flatten()
}

/// Runs `fut` with `lease` added to the locks this task holds.
pub(crate) async fn holding<F: Future>(locker: usize, lease: Arc<LeaseState>, fut: F) -> F::Output {
    let mut held = HELD.try_with(Clone::clone).unwrap_or_default();
    held.push(Held { locker, lease });
    HELD.scope(held, fut).await
}
