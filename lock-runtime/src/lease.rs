//! `Lease`: one held lock, its validity, and its release.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::locker::Locker;
use crate::{LockError, LostReason};

/// What every part of the engine knows about one held lease.
pub(crate) struct LeaseShared {
    pub name: String,
    pub key: String,
    pub channel: String,
    pub token: String,
    pub fence: u64,
    pub ttl: Duration,
    pub renew: Duration,
    pub drift: Duration,
    /// When the acquire request was sent: validity and `min_hold` count from here.
    pub started: Instant,
    pub min_hold: Duration,
    pub status: watch::Sender<Status>,
    /// Set once the lease is released or dropped: the watchdog stops renewing it.
    pub ended: AtomicBool,
    /// Where the lease sits in the watchdog's schedule; only touched under the schedule's lock.
    pub slot: std::sync::Mutex<Option<(Instant, u64)>>,
}

/// The lease's current standing, updated by the watchdog.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Status {
    /// The last instant at which no other process can hold the key: the start of the last
    /// confirmed renewal (or acquire) + ttl - drift.
    pub valid_until: Instant,
    pub lost: Option<LostReason>,
}

impl LeaseShared {
    pub(crate) fn lost_error(&self, reason: LostReason) -> LockError {
        LockError::Lost {
            name: self.name.clone(),
            reason,
        }
    }

    /// Records a renewal whose request was sent at `sent`. Loss is final: a confirmation that
    /// arrives after the lease's validity ran out does not revive it (someone else may have
    /// taken the key in between); the lease is then marked lost.
    pub(crate) fn confirm(&self, sent: Instant) {
        let until = sent + self.ttl - self.drift;
        let now = Instant::now();
        self.status.send_if_modified(|s| {
            if s.lost.is_some() {
                false
            } else if now >= s.valid_until {
                s.lost = Some(LostReason::ValidityExpired);
                true
            } else if until > s.valid_until {
                s.valid_until = until;
                true
            } else {
                false
            }
        });
    }

    pub(crate) fn mark_lost(&self, reason: LostReason) {
        self.status.send_if_modified(|s| {
            if s.lost.is_none() {
                s.lost = Some(reason);
                true
            } else {
                false
            }
        });
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// How long a release must keep the key: the rest of `min_hold`, rounded up so that the key
    /// never goes before it; 0 means delete.
    pub(crate) fn keep_ms(&self) -> u64 {
        let keep = (self.started + self.min_hold).saturating_duration_since(Instant::now());
        if keep.is_zero() {
            0
        } else {
            keep.as_millis() as u64 + 1
        }
    }
}

/// A held lock. Renewed in the background until [`Lease::release`] or drop; dropping it
/// releases the key in the background (on the current tokio runtime).
///
/// A lease taken by a nested call on a name its task already holds (see [`Locker::run`]) is the
/// outer lease seen again: releasing or dropping it does nothing, the outer call releases.
pub struct Lease {
    pub(crate) shared: Arc<LeaseShared>,
    pub(crate) locker: Locker,
    /// Released already, or nested (someone else releases).
    pub(crate) released: bool,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.shared.name)
            .field("fence", &self.shared.fence)
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The random token stored in the key: only this lease can renew or release it.
    pub fn token(&self) -> &str {
        &self.shared.token
    }

    /// The fencing token: grows with every acquisition of this name. Give it to your storage so
    /// that it can refuse writes carrying a lower fence than one it has already seen.
    pub fn fence(&self) -> u64 {
        self.shared.fence
    }

    /// Until when the lease is known to be held (monotonic clock); moves forward with each
    /// confirmed renewal.
    pub fn deadline(&self) -> Instant {
        self.shared.status.borrow().valid_until
    }

    /// Whether the lease is still held: not reported lost and inside its validity.
    pub fn is_held(&self) -> bool {
        let s = *self.shared.status.borrow();
        s.lost.is_none() && Instant::now() < s.valid_until
    }

    /// Resolves when the lease is lost, with the reason.
    pub async fn lost(&self) -> LostReason {
        let mut rx = self.shared.status.subscribe();
        loop {
            let s = *rx.borrow_and_update();
            if let Some(reason) = s.lost {
                return reason;
            }
            tokio::select! {
                () = tokio::time::sleep_until(s.valid_until) => {
                    if rx.borrow().valid_until <= Instant::now() {
                        return LostReason::ValidityExpired;
                    }
                }
                _ = rx.changed() => {}
            }
        }
    }

    pub(crate) fn status(&self) -> watch::Receiver<Status> {
        self.shared.status.subscribe()
    }

    /// Releases the lock now: deletes the key if it still holds this lease's token (or shortens it
    /// to what is left of `min_hold`) and wakes waiters. `Lost` if the key was no longer ours.
    pub async fn release(mut self) -> Result<(), LockError> {
        if self.released {
            return Ok(());
        }
        // Marked only once done: if this future is dropped mid-way, the lease's drop releases
        // in the background (compare-and-delete twice is harmless).
        let out = release(&self.locker, &self.shared).await;
        self.released = true;
        out
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.shared.ended.store(true, Ordering::Release);
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let (locker, shared) = (self.locker.clone(), Arc::clone(&self.shared));
                handle.spawn(async move {
                    if let Err(e) = release(&locker, &shared).await {
                        tracing::debug!(lock = %shared.name, error = %e, "background release failed");
                    }
                });
            }
            Err(_) => tracing::warn!(
                lock = %self.shared.name,
                "lease dropped outside a tokio runtime: the key stays until its ttl runs out"
            ),
        }
    }
}

/// Compare-and-delete on every node at once; holds when a majority confirms.
pub(crate) async fn release(locker: &Locker, shared: &Arc<LeaseShared>) -> Result<(), LockError> {
    shared.ended.store(true, Ordering::Release);
    locker.inner.watchdog.remove(shared);
    let keep_ms = shared.keep_ms();
    let nodes = &locker.inner.nodes;
    if let [node] = nodes.as_slice() {
        return match node
            .release(&shared.key, &shared.token, keep_ms, &shared.channel)
            .await
        {
            Ok(true) => Ok(()),
            Ok(false) => Err(shared.lost_error(LostReason::NotOwner)),
            Err(e) => Err(node.redis_error(&shared.name, e)),
        };
    }
    let needed = locker.quorum();
    // Decided once a majority confirmed (or denied): a node that does not answer must not keep
    // the caller waiting for its response timeout; its request goes on in the background.
    let results = crate::fanout::on_nodes_until(
        nodes,
        |node| {
            let shared = Arc::clone(shared);
            async move {
                node.release(&shared.key, &shared.token, keep_ms, &shared.channel)
                    .await
            }
        },
        |replies| {
            let ours = replies
                .iter()
                .filter(|r| matches!(r, Some(Ok(true))))
                .count();
            let not_ours = replies
                .iter()
                .filter(|r| matches!(r, Some(Ok(false))))
                .count();
            ours >= needed || not_ours > nodes.len() - needed
        },
    )
    .await;
    let mut ours = 0;
    let mut failures = Vec::new();
    for (node, res) in nodes.iter().zip(results) {
        match res {
            Some(Ok(true)) => ours += 1,
            Some(Ok(false)) | None => {}
            Some(Err(e)) => failures.push((node.addr().to_owned(), e.to_string())),
        }
    }
    if ours >= needed {
        Ok(())
    } else if nodes.len() - failures.len() < needed {
        Err(LockError::QuorumUnavailable {
            name: shared.name.clone(),
            got: ours,
            needed,
            failures,
        })
    } else {
        Err(shared.lost_error(LostReason::NotOwner))
    }
}

pub(crate) fn lease_on(locker: &Locker, shared: LeaseShared) -> Lease {
    let shared = Arc::new(shared);
    locker
        .inner
        .watchdog
        .register(&locker.inner.nodes, locker.quorum(), Arc::clone(&shared));
    Lease {
        shared,
        locker: locker.clone(),
        released: false,
    }
}
