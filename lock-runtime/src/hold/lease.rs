//! `Lease`: one held lock, as its holder sees it, and its release.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::hold::watchdog::Renewing;
use crate::model::hold::Held;
use crate::model::keys::Keys;
use crate::plumbing::telemetry;
use crate::state::lease_state::{Granted, LeaseState};
use crate::state::status::StatusRx;
use crate::{LockError, LockOptions, LostReason};

/// A held lock. Renewed in the background until [`Lease::release`] or drop; dropping it
/// releases the key in the background (on the current tokio runtime).
///
/// A lease taken by a nested call on a name its task already holds (see
/// [`Locker::run`](crate::Locker::run)) is the outer lease seen again: releasing or dropping it
/// does nothing, the outer call releases.
///
/// Taken by hand, a lease is the body's to watch: stop working when it is [`lost`](Self::lost),
/// and pass its [`fence`](Self::fence) with every write, so that storage can refuse a write from
/// a holder that lost the lock while paused.
///
/// ```no_run
/// use std::time::Duration;
/// use lock_runtime::{LockError, LockOptions, Locker};
///
/// async fn export(locker: &Locker) -> Result<(), LockError> {
///     let opts = LockOptions::new(Duration::from_secs(60));
///     let lease = locker.acquire("export", &opts).await?;
///     tokio::select! {
///         reason = lease.lost() => eprintln!("stopped: lock `{}` lost ({reason})", lease.name()),
///         () = write_rows(lease.fence()) => {}
///     }
///     lease.release().await // `Lost` if the key was no longer ours
/// }
///
/// /// Stands for writes that carry the fence, to a store that keeps the highest it has seen.
/// async fn write_rows(fence: u64) {
///     let _ = fence;
/// }
/// ```
pub struct Lease {
    pub(crate) state: Arc<LeaseState>,
    /// The lease's renewal, and its way to the servers; `None` for a nested lease: someone
    /// else releases.
    renewing: Option<Renewing>,
    /// Released already (or nested).
    released: bool,
    /// Holds nothing: a body run without the lock (see `LockOptions::with_fail_open`).
    unlocked: bool,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.state.name)
            .field("fence", &self.state.fence())
            .field("held", &self.is_held())
            .finish_non_exhaustive()
    }
}

impl Lease {
    /// A lease this handle owns: renewed by `renewing`, released on release or drop.
    pub(crate) fn owned(state: Arc<LeaseState>, renewing: Renewing) -> Self {
        Self {
            state,
            renewing: Some(renewing),
            released: false,
            unlocked: false,
        }
    }

    /// The same lease seen again by a nested call: neither renews nor releases.
    pub(crate) fn nested(state: Arc<LeaseState>) -> Self {
        Self {
            state,
            renewing: None,
            released: true,
            unlocked: false,
        }
    }

    /// A lease that holds nothing, for a body that runs without the lock while the servers are
    /// unreachable (see `LockOptions::with_fail_open`): fence 0, not held, never lost (nothing
    /// can be), bounded by `max_exec` only.
    pub(crate) fn unlocked(name: String, lock: Keys, opts: &LockOptions) -> Self {
        let state = LeaseState::new(Granted {
            name,
            lock,
            token: String::new(),
            held: Held::Key,
            fence: 0,
            plain: false,
            // Valid past `max_exec` (at most `ttl - drift`): only `max_exec` ends the body.
            ttl: opts.ttl(),
            set_for: opts.ttl(),
            renew: opts.renew(),
            min_hold: Duration::ZERO,
            started: Instant::now(),
            template: opts.template(),
        });
        Self {
            state: Arc::new(state),
            renewing: None,
            released: true,
            unlocked: true,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// The whole value stored in the key: a random token of 22 characters followed by who took
    /// it, `<token>;h=<host>;p=<pid>[;l=<label>];w=0` (see [`Holder`](crate::Holder)).
    /// Only this lease can renew or release the key; the scripts compare this value as one
    /// opaque string, or its form with `;w=1` at the end, which a waiter queued behind this
    /// lease writes. For a shared hold, this holder's own value among the shared holders (the
    /// lock's key then holds `shared:` and the first shared holder's value).
    pub fn token(&self) -> &str {
        self.state.holder_value()
    }

    /// The fencing token: grows with every acquisition of this name. Give it to your storage so
    /// that it can refuse writes carrying a lower fence than one it has already seen.
    pub fn fence(&self) -> u64 {
        self.state.fence()
    }

    /// Until when the lease is known to be held (monotonic clock); moves forward with each
    /// confirmed renewal.
    pub fn deadline(&self) -> Instant {
        self.state.valid_until()
    }

    /// Whether the lease is still held: not released, not reported lost and inside its
    /// validity. A handle to a lease its outer call released (a nested lease that escaped it)
    /// is not held, nor is the lease of a body run without the lock (see
    /// [`LockOptions::with_fail_open`]).
    pub fn is_held(&self) -> bool {
        if self.unlocked {
            return false;
        }
        let s = self.state.status.get();
        !self.state.is_ended() && s.lost.is_none() && Instant::now() < s.valid_until
    }

    /// `Ok` while the lease is held (see [`Self::is_held`]); otherwise the error a locked call
    /// would end with: [`LockError::Lost`] with the reason (and, for
    /// [`LostReason::Unreachable`], the last Redis error as its source; `Unreachable` for the
    /// lease of a body run without the lock).
    pub fn ensure_held(&self) -> Result<(), LockError> {
        let s = self.state.status.get();
        let reason = match s.lost {
            _ if self.unlocked => LostReason::Unreachable,
            Some(reason) => reason,
            None if self.state.is_ended() => LostReason::Released,
            None if Instant::now() >= s.valid_until => self.state.expired_reason(),
            None => return Ok(()),
        };
        Err(self.state.lost_error(reason))
    }

    /// Resolves when the lease is lost, with the reason; [`LostReason::Released`] once it was
    /// released (seen by a handle that outlived its outer call). Never for the lease of a body
    /// run without the lock, which holds nothing to lose.
    pub async fn lost(&self) -> LostReason {
        if self.unlocked {
            // Nothing is held, so nothing can be lost: the body ends by itself or at `max_exec`.
            return std::future::pending().await;
        }
        let mut rx = self.state.status.subscribe();
        loop {
            let s = rx.borrow_and_update();
            if let Some(reason) = s.lost {
                return reason;
            }
            if self.state.is_ended() {
                return LostReason::Released;
            }
            tokio::select! {
                () = tokio::time::sleep_until(s.valid_until) => {
                    if rx.get().valid_until <= Instant::now() {
                        self.state.mark_lost(self.state.expired_reason());
                        // The first reason recorded stays.
                        return rx.get().lost.unwrap_or(LostReason::ValidityExpired);
                    }
                }
                _ = rx.changed() => {}
            }
        }
    }

    pub(crate) fn status(&self) -> StatusRx<'_> {
        self.state.status.subscribe()
    }

    /// Releases the lock now: deletes the key if it still holds this lease's token (or shortens it
    /// to what is left of `min_hold`) and wakes waiters. `Lost` if the key was no longer ours.
    pub async fn release(mut self) -> Result<(), LockError> {
        if self.released {
            return Ok(());
        }
        self.stop_renewing();
        let Some(renewing) = &self.renewing else {
            return Ok(());
        };
        // Marked only once done: if this future is dropped mid-way, the lease's drop releases
        // in the background (compare-and-delete twice is harmless).
        let mut out = renewing.deployment().release(&self.state).await;
        self.released = true;
        released(&self.state, &mut out);
        out
    }

    /// Ends the lease and takes it out of the schedule. The renewal handle stays: it knows the
    /// servers to release the lease on.
    fn stop_renewing(&mut self) {
        self.state.end();
        if let Some(renewing) = &mut self.renewing {
            renewing.stop();
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.stop_renewing();
        let Some(renewing) = &self.renewing else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let (deployment, state) =
                    (Arc::clone(renewing.deployment()), Arc::clone(&self.state));
                handle.spawn(async move {
                    let mut out = deployment.release(&state).await;
                    released(&state, &mut out);
                });
            }
            Err(_) => tracing::warn!(
                target: "lock_runtime::release",
                lock = %self.state.name,
                "lease dropped outside a tokio runtime: the key stays until its ttl runs out"
            ),
        }
    }
}

/// Logs and counts how a release went. A key found no longer ours is a loss of its own, unless
/// the loss was reported already: then the key is gone, as expected, and the loss seen first
/// is the reason.
fn released(state: &LeaseState, out: &mut Result<(), LockError>) {
    match out {
        Ok(()) => {
            let waited = state
                .handed_out
                .get()
                .map(|(begun, handed)| *handed - *begun);
            telemetry::released(state.label(), state.fence(), waited, state.held_since());
        }
        Err(LockError::Lost { reason, .. }) => match state.status.get().lost {
            Some(first) => *out = Err(state.lost_error(first)),
            None => {
                state.mark_lost(*reason);
                telemetry::lost_at_release(state.label(), state.held_since());
            }
        },
        Err(e) => telemetry::release_failed(state.label(), e, state.held_since()),
    }
}
