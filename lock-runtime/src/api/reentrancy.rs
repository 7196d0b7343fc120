//! The locks the current task holds through `run` (and so through the attribute), so that a
//! nested call on one of them runs under the lease already held instead of waiting for itself.
//!
//! Task-local on purpose: another task, even one spawned by the holder, is another holder.
//!
//! Nested sections on one name take turns: a body may run several at once (`join!`, `select!`,
//! a stream of futures), and each expects to be alone inside, as a lock promises. Each frame
//! (the outermost call, and each nested section) has a place where the sections nested
//! directly in it queue, first come first served; a section strictly inside another queues in
//! the inner one's place, so it never waits for the section around it.

use std::sync::Arc;

use tokio::sync::{Mutex, MutexGuard};

use crate::state::lease_state::LeaseState;

tokio::task_local! {
    static HELD: Holding;
}

#[derive(Clone)]
struct Held {
    /// Which locker: an identity its clones share.
    locker: usize,
    lease: Arc<LeaseState>,
    /// Where the sections nested directly in this frame take turns: `None` for the outermost
    /// call (the lease's own place, no allocation), a place of its own for a nested section.
    sections: Option<Arc<Mutex<()>>>,
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

/// A lease this task holds, found by a nested call, in the frame nearest to that call.
pub(crate) struct Found(Held);

impl Found {
    /// The lease held.
    pub(crate) fn lease(&self) -> &Arc<LeaseState> {
        &self.0.lease
    }

    /// Waits for this nested section's turn among the sections of its frame.
    pub(crate) async fn turn(&self) -> MutexGuard<'_, ()> {
        match &self.0.sections {
            Some(place) => place.lock().await,
            None => self.0.lease.sections.lock().await,
        }
    }

    /// Runs `fut`, a nested section, as a frame of its own: sections nested in it take turns
    /// among themselves, not with it.
    pub(crate) fn section<F: Future>(&self, fut: F) -> impl Future<Output = F::Output> {
        let place = Some(Arc::new(Mutex::new(())));
        enter(self.0.locker, Arc::clone(&self.0.lease), place, fut)
    }
}

/// The lease this task holds on `key` through locker `locker`, if any.
pub(crate) fn find(locker: usize, key: &str) -> Option<Found> {
    HELD.try_with(|held| {
        held.iter()
            .find(|h| h.locker == locker && h.lease.lock_key() == key)
            .map(|h| Found(h.clone()))
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
    enter(locker, lease, None, fut)
}

fn enter<F: Future>(
    locker: usize,
    lease: Arc<LeaseState>,
    sections: Option<Arc<Mutex<()>>>,
    fut: F,
) -> impl Future<Output = F::Output> {
    let outer = HELD
        .try_with(|held| {
            let mut outer = held.outer.clone();
            outer.push(held.innermost.clone());
            outer
        })
        .unwrap_or_default();
    let innermost = Held {
        locker,
        lease,
        sections,
    };
    HELD.scope(Holding { innermost, outer }, fut)
}
