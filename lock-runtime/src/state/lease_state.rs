//! What every part of the engine knows about one held lease, and how long it is known valid.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::model::hold::Held;
use crate::model::keys::Keys;
use crate::plumbing::telemetry::Label;
use crate::plumbing::unpoisoned::Unpoisoned;
use crate::state::status::{Status, StatusCell};
use crate::{LockError, LostReason};

/// One held lease: its identity, its lengths, and its standing (updated by the watchdog).
pub(crate) struct LeaseState {
    pub name: String,
    /// The names of the key this lease holds: the lock's own, or its permit's.
    pub keys: Keys,
    /// The token the key holds: the attempt's, or for a shared hold the lock's shared value,
    /// which every shared holder renews.
    pub token: String,
    /// What is held: the lock's key, a permit, or a place among the shared holders.
    pub held: Held,
    /// A second key each renewal renews with this lease's own (`(key, token)`, see
    /// `Held::also_renews`), computed once.
    pub also_renews: Option<(String, String)>,
    /// 0 until computed, for a lease taken without one (see `LockOptions::without_fence`).
    fence: AtomicU64,
    /// The lease came by the plain-command path: no waiter had queued when it was taken (its
    /// release tries the short script first), and its fence is written to the counter at
    /// release.
    plain: AtomicBool,
    /// The key's expiry, set again at each renewal (the options' `lease`).
    pub ttl: Duration,
    pub renew: Duration,
    pub drift: Duration,
    /// When the acquire request was sent: validity and `min_hold` count from here.
    pub started: Instant,
    pub min_hold: Duration,
    /// The name's template, for metrics (see `LockOptions::with_template`).
    pub template: Option<&'static str>,
    pub status: StatusCell,
    /// Set once the lease is released or dropped: nothing renews it any more.
    ended: AtomicBool,
    /// Set when a locked call's body starts under the lease (`Locker::run`, the attribute): a
    /// loss then cancels the body. Not set for a lease taken by hand (`Locker::acquire`).
    pub runs_body: AtomicBool,
    /// When the call that took the lease began, and when the lease was handed to it: set then,
    /// for the release's event (its wait and hold time), when that event is on.
    pub handed_out: OnceLock<(Instant, Instant)>,
    /// The acquire's grant is known. A lease renewed early (see `LeaseState::provisional`) is
    /// not granted until its acquire is answered.
    granted: AtomicBool,
    /// How the renewals since the last confirmed one failed.
    failing: Mutex<Failing>,
    /// Where the sections nested directly in the outermost call take turns (see `held`).
    pub sections: tokio::sync::Mutex<()>,
}

/// Renewals that failed with a server error since the last confirmed one.
#[derive(Default)]
struct Failing {
    /// The last error; `None` once a renewal is confirmed.
    error: Option<redis::RedisError>,
    /// A failed renewal of this hold was logged already: once per hold is enough.
    logged: bool,
}

/// How often a lease of `lease`, renewed every `renew`, is renewed when a round trip takes
/// `rtt`: `renew`, or on a slow link a third of what the lease leaves after one round trip,
/// `(lease - rtt) / 3`, so that of the renewals sent one and two periods after a confirmed one,
/// either is confirmed before that one's validity ends (the default `renew`, `lease / 3`, is the
/// same rule without a round trip). Renewals then overlap (several are in flight at once). Never
/// more often than every `lease / 20`: a server slowed down by load is not sent ever more.
pub(crate) fn renew_period(lease: Duration, renew: Duration, rtt: Duration) -> Duration {
    renew.min((lease.saturating_sub(rtt) / 3).max(lease / 20))
}

/// The parts of a lease fixed at acquire time.
pub(crate) struct Granted {
    pub name: String,
    /// The names of the lock's key (a permit's key derives from them).
    pub lock: Keys,
    pub token: String,
    pub held: Held,
    pub fence: u64,
    pub plain: bool,
    /// The key's expiry (the options' `lease`).
    pub ttl: Duration,
    /// How long the key was set for by the request sent at `started`: the ttl, or the waiter's
    /// grace for a lock granted by a release (extended to the ttl by the first renewal).
    pub set_for: Duration,
    pub renew: Duration,
    pub min_hold: Duration,
    pub started: Instant,
    pub template: Option<&'static str>,
}

impl LeaseState {
    /// The key's expiry in ms, as a renewal sets it.
    pub(crate) fn ttl_ms(&self) -> u64 {
        self.ttl.as_millis() as u64
    }

    /// The value a holder is known by: its token, or a shared holder's own value (its place in
    /// the set of holders without the fence).
    pub(crate) fn holder_value(&self) -> &str {
        self.held.holder_value(&self.token)
    }

    /// The key this lease holds (the lock's, or its permit's).
    pub(crate) fn key(&self) -> &str {
        &self.keys.key
    }

    /// Whether this is the hold of one permit of a lock with `permits = N`.
    pub(crate) fn is_permit(&self) -> bool {
        matches!(self.held, Held::Permit { .. })
    }

    /// The lock's key: for a permit, the key of the lock it is a permit of.
    pub(crate) fn lock_key(&self) -> &str {
        self.keys.lock_key()
    }

    /// A lease valid until `started + set_for - drift`.
    pub(crate) fn new(g: Granted) -> Self {
        let state = Self::provisional(g);
        state.granted.store(true, Ordering::Release);
        state
    }

    /// The lease an acquire still unanswered would grant, so that it can be renewed before the
    /// reply comes (on a link so slow that a renewal sent after the reply would come too late).
    /// [`Self::grant`] makes it the lease once the acquire is granted; [`Self::discard`] drops it
    /// otherwise.
    pub(crate) fn provisional(g: Granted) -> Self {
        let drift = crate::drift_for(g.ttl);
        let keys = g.held.keys(&g.lock);
        let status = StatusCell::new(Status {
            valid_until: g.started + g.set_for.saturating_sub(crate::drift_for(g.set_for)),
            lost: None,
        });
        Self {
            name: g.name,
            also_renews: g.held.also_renews(&keys),
            keys,
            token: g.token,
            held: g.held,
            fence: AtomicU64::new(g.fence),
            plain: AtomicBool::new(g.plain),
            ttl: g.ttl,
            renew: g.renew,
            drift,
            started: g.started,
            min_hold: g.min_hold,
            template: g.template,
            status,
            ended: AtomicBool::new(false),
            runs_body: AtomicBool::new(false),
            handed_out: OnceLock::new(),
            granted: AtomicBool::new(false),
            failing: Mutex::default(),
            sections: tokio::sync::Mutex::new(()),
        }
    }

    /// The acquire of a [`Self::provisional`] lease was granted, with this fence.
    pub(crate) fn grant(&self, fence: u64, plain: bool) {
        self.set_fence(fence);
        self.plain.store(plain, Ordering::Release);
        self.granted.store(true, Ordering::Release);
    }

    /// Whether the acquire's grant is known (see [`Self::provisional`]).
    pub(crate) fn is_granted(&self) -> bool {
        self.granted.load(Ordering::Acquire)
    }

    /// Ends a [`Self::provisional`] lease whose acquire was not granted: never held, nothing to
    /// count or log.
    pub(crate) fn discard(&self) {
        self.ended.store(true, Ordering::Release);
    }

    /// Whether the lease came by the plain-command path (see the field).
    pub(crate) fn is_plain(&self) -> bool {
        self.plain.load(Ordering::Acquire)
    }

    /// How often this lease is renewed when a round trip takes `rtt` (see [`renew_period`]).
    pub(crate) fn period(&self, rtt: Duration) -> Duration {
        renew_period(self.ttl, self.renew, rtt)
    }

    /// Records a renewal that failed with `error`; true for the first one of this hold, which
    /// is logged.
    pub(crate) fn renewal_failed(&self, error: &redis::RedisError) -> bool {
        let mut failing = self.failing.locked();
        failing.error = Some(error.clone());
        !std::mem::replace(&mut failing.logged, true)
    }

    /// Why a lease whose validity ran out is lost: [`LostReason::Unreachable`] when the renewals
    /// since the last confirmed one failed with server errors.
    pub(crate) fn expired_reason(&self) -> LostReason {
        match self.failing.locked().error {
            Some(_) => LostReason::Unreachable,
            None => LostReason::ValidityExpired,
        }
    }

    /// The fencing token; 0 for a lease taken without one, until a nested call computes it.
    pub(crate) fn fence(&self) -> u64 {
        self.fence.load(Ordering::Acquire)
    }

    /// Records a fence computed for a lease taken without one; the first one recorded stays
    /// (two nested calls at once may each compute one, and each wrote the counter). Returns the
    /// fence the lease has now.
    pub(crate) fn set_fence(&self, fence: u64) -> u64 {
        match self
            .fence
            .compare_exchange(0, fence, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => fence,
            Err(first) => first,
        }
    }

    /// The `lock` label of this lease's metrics and events.
    pub(crate) fn label(&self) -> Label<'_> {
        Label {
            template: self.template,
            name: &self.name,
            mode: self.held.kind().label(),
        }
    }

    /// The error of a loss for `reason`; an unreachable server's last error is its source.
    pub(crate) fn lost_error(&self, reason: LostReason) -> LockError {
        let source = match reason {
            LostReason::Unreachable => self.failing.locked().error.clone(),
            _ => None,
        };
        LockError::Lost {
            name: self.name.clone(),
            reason,
            source,
        }
    }

    /// Records a renewal whose request was sent at `sent`; false when the lease is lost. Loss
    /// is final: a confirmation that arrives after the lease's validity ran out does not revive
    /// it (someone else may have taken the key in between); the lease is then marked lost.
    pub(crate) fn confirm(&self, sent: Instant) -> bool {
        let until = sent + self.ttl - self.drift;
        let now = Instant::now();
        let mut lost_now = None;
        // The failures since the last confirmed renewal end here; they may be why it is late.
        let expired = match self.failing.locked().error.take() {
            Some(_) => LostReason::Unreachable,
            None => LostReason::ValidityExpired,
        };
        self.status.send_if_modified(|s| {
            if s.lost.is_some() {
                false
            } else if now >= s.valid_until {
                s.lost = Some(expired);
                lost_now = Some(expired);
                true
            } else if until > s.valid_until {
                s.valid_until = until;
                true
            } else {
                false
            }
        });
        if let Some(reason) = lost_now {
            self.log_lost(reason);
        } else if self.status.get().lost.is_none() {
            crate::plumbing::telemetry::renewed(self.label(), sent.elapsed());
        }
        self.status.get().lost.is_none()
    }

    /// Records the loss (once: loss is final); the first report is logged and counted.
    pub(crate) fn mark_lost(&self, reason: LostReason) {
        let first = self.status.send_if_modified(|s| {
            if s.lost.is_none() {
                s.lost = Some(reason);
                true
            } else {
                false
            }
        });
        if first && !self.is_ended() {
            self.log_lost(reason);
        }
    }

    /// Logs and counts a loss; a lease whose acquire is unanswered yet was never held.
    fn log_lost(&self, reason: LostReason) {
        if !self.is_granted() {
            return;
        }
        let body = self.runs_body.load(Ordering::Acquire);
        crate::plumbing::telemetry::lost(self.label(), reason, self.held_since(), body);
    }

    /// Where the hold time of events counts from: the lease handed to its caller, else the
    /// request that took it.
    pub(crate) fn held_since(&self) -> Instant {
        self.handed_out
            .get()
            .map_or(self.started, |(_, handed)| *handed)
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.status.get().valid_until
    }

    /// Marks the lease released or dropped; true the first time. Whoever waits on the lease's
    /// standing (`Lease::lost` on a handle that outlived it) is woken.
    pub(crate) fn end(&self) -> bool {
        let first = !self.ended.swap(true, Ordering::AcqRel);
        if first {
            crate::plumbing::telemetry::ended(self.label(), self.started);
            self.status.send_if_modified(|_| true);
        }
        first
    }

    pub(crate) fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// How long a release must keep the key: the rest of `min_hold`, rounded up so that the key
    /// never goes before it; 0 means delete.
    pub(crate) fn keep_ms(&self) -> u64 {
        if self.min_hold.is_zero() {
            return 0;
        }
        let keep = (self.started + self.min_hold).saturating_duration_since(Instant::now());
        if keep.is_zero() {
            0
        } else {
            keep.as_millis() as u64 + 1
        }
    }
}
