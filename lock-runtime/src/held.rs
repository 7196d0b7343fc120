//! The locks the current task holds through `run` (and so through the attribute), so that a
//! nested call on one of them runs under the lease already held instead of waiting for itself.
//!
//! Task-local on purpose: another task, even one spawned by the holder, is another holder.

use std::sync::Arc;

use crate::validity::LeaseState;

tokio::task_local! {
    static HELD: Holding;
}

#[derive(Clone)]
struct Held {
    /// Which locker: an identity its clones share.
    locker: usize,
    lease: Arc<LeaseState>,
}

/// What the task holds: the innermost lease inline, and those of the calls around it (empty for
/// an outermost call, which so allocates nothing).
struct Holding {
    innermost: Held,
    outer: Vec<Held>,
}

impl Holding {
    /// Innermost first.
    fn iter(&self) -> impl Iterator<Item = &Held> {
        std::iter::once(&self.innermost).chain(self.outer.iter().rev())
    }
}

/// The lease this task holds on `key` through locker `locker`, if any.
pub(crate) fn find(locker: usize, key: &str) -> Option<Arc<LeaseState>> {
    HELD.try_with(|held| {
        held.iter()
            .find(|h| h.locker == locker && h.lease.key == key)
            .map(|h| Arc::clone(&h.lease))
    })
    .ok()
    .flatten()
}

/// Runs `fut` with `lease` added to the locks this task holds (to be awaited at once, by the
/// task that called it). Not an `async fn`: one that takes a future keeps it twice.
pub(crate) fn holding<F: Future>(
    locker: usize,
    lease: Arc<LeaseState>,
    fut: F,
) -> impl Future<Output = F::Output> {
    let outer = HELD
        .try_with(|held| {
            let mut outer = held.outer.clone();
            outer.push(held.innermost.clone());
            outer
        })
        .unwrap_or_default();
    let innermost = Held { locker, lease };
    HELD.scope(Holding { innermost, outer }, fut)
}
