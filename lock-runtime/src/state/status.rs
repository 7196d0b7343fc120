//! A lease's standing, shared by the watchdog (which changes it) and the body's race and
//! `Lease::lost` (which wait for a change).
//!
//! Not a `tokio::sync::watch` channel: every locked call would pay for one whether anyone waits
//! or not (its allocation, and the sender's drop, which wakes 8 notifiers, each behind a lock).
//! This cell lives inside the lease's state, and notifies only when the standing changes.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::LostReason;
use crate::plumbing::unpoisoned::Unpoisoned;

/// The lease's current standing.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Status {
    /// The last instant at which no other process can hold the key: the start of the last
    /// confirmed renewal (or acquire) + ttl - drift.
    pub valid_until: Instant,
    pub lost: Option<LostReason>,
}

/// The standing, and a version that grows with each change.
pub(crate) struct StatusCell {
    status: Mutex<Status>,
    version: AtomicU64,
    changed: Notify,
}

impl StatusCell {
    pub(crate) fn new(status: Status) -> Self {
        Self {
            status: Mutex::new(status),
            version: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }

    /// The standing now.
    pub(crate) fn get(&self) -> Status {
        *self.status.locked()
    }

    /// Lets `modify` change the standing; when it says it did, wakes whoever waits for a change.
    /// Returns what `modify` said.
    pub(crate) fn send_if_modified(&self, modify: impl FnOnce(&mut Status) -> bool) -> bool {
        let modified = {
            let mut status = self.status.locked();
            let modified = modify(&mut status);
            if modified {
                // Inside the lock: a reader that saw the new standing also sees the new version.
                self.version.fetch_add(1, Ordering::AcqRel);
            }
            modified
        };
        if modified {
            self.changed.notify_waiters();
        }
        modified
    }

    /// A view that can wait for the next change.
    pub(crate) fn subscribe(&self) -> StatusRx<'_> {
        StatusRx {
            cell: self,
            seen: self.version.load(Ordering::Acquire),
        }
    }
}

/// One waiter's view of a [`StatusCell`]: which version it has seen.
pub(crate) struct StatusRx<'a> {
    cell: &'a StatusCell,
    seen: u64,
}

impl StatusRx<'_> {
    /// The standing now, marked as seen.
    pub(crate) fn borrow_and_update(&mut self) -> Status {
        let status = self.cell.status.locked();
        self.seen = self.cell.version.load(Ordering::Acquire);
        *status
    }

    /// The standing now.
    pub(crate) fn get(&self) -> Status {
        self.cell.get()
    }

    /// Resolves once the standing changed since it was last seen (and marks it seen).
    pub(crate) async fn changed(&mut self) {
        loop {
            let notified = self.cell.changed.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the version is read: a change in between still wakes it.
            notified.as_mut().enable();
            let version = self.cell.version.load(Ordering::Acquire);
            if version != self.seen {
                self.seen = version;
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    fn cell() -> Arc<StatusCell> {
        Arc::new(StatusCell::new(Status {
            valid_until: Instant::now() + Duration::from_secs(1),
            lost: None,
        }))
    }

    #[tokio::test]
    async fn a_waiter_wakes_on_a_change_and_not_on_a_call_that_changed_nothing() {
        let cell = cell();
        let mut rx = cell.subscribe();
        let waiter = {
            let cell = Arc::clone(&cell);
            tokio::spawn(async move {
                let mut rx = cell.subscribe();
                rx.changed().await;
                rx.get().lost
            })
        };
        tokio::task::yield_now().await;
        assert!(!cell.send_if_modified(|_| false));
        assert!(!waiter.is_finished());
        assert!(cell.send_if_modified(|s| {
            s.lost = Some(LostReason::NotOwner);
            true
        }));
        let lost = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken by the change")
            .unwrap();
        assert_eq!(lost, Some(LostReason::NotOwner));
        // A change before the wait is not missed either.
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .expect("a change made before the wait counts");
        assert_eq!(rx.borrow_and_update().lost, Some(LostReason::NotOwner));
    }
}
