//! The locks the current task holds through `run` (and so through the attribute), so that a
//! nested call on one of them runs under the lease already held instead of waiting for itself.
//!
//! Task-local on purpose: another task, even one spawned by the holder, is another holder.

use std::sync::Arc;

use crate::Locker;
use crate::lease::LeaseShared;

tokio::task_local! {
    static HELD: Vec<Held>;
}

#[derive(Clone)]
struct Held {
    /// Which locker: the address of its shared state.
    locker: usize,
    lease: Arc<LeaseShared>,
}

fn id(locker: &Locker) -> usize {
    Arc::as_ptr(&locker.inner) as usize
}

/// The lease this task holds on `key` through `locker`, if any.
pub(crate) fn find(locker: &Locker, key: &str) -> Option<Arc<LeaseShared>> {
    let me = id(locker);
    HELD.try_with(|held| {
        held.iter()
            .rev()
            .find(|h| h.locker == me && h.lease.key == key)
            .map(|h| Arc::clone(&h.lease))
    })
    .ok()
    .flatten()
}

/// Runs `fut` with `lease` added to the locks this task holds.
pub(crate) async fn holding<F: Future>(
    locker: &Locker,
    lease: Arc<LeaseShared>,
    fut: F,
) -> F::Output {
    let mut held = HELD.try_with(Clone::clone).unwrap_or_default();
    held.push(Held {
        locker: id(locker),
        lease,
    });
    HELD.scope(held, fut).await
}
