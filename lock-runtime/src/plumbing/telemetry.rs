//! What the engine tells an operator: `tracing` events, and (feature `metrics`) counters,
//! histograms and gauges through the `metrics` facade.
//!
//! Events go to four targets, documented in `docs/operations.md`: `lock_runtime` (the locker
//! and its servers), `lock_runtime::acquire` (taking a lock), `lock_runtime::hold` (a held
//! lease: renewal, loss, `max_exec`) and `lock_runtime::release` (one INFO event per hold, with
//! its wait and hold time, and what went wrong at release). `tests/log_targets.rs` keeps every
//! event of the crate on one of them.
//!
//! Every metric has two labels: `lock`, the name's template (see
//! [`LockOptions::with_template`](crate::LockOptions::with_template)), or the name itself when
//! no template was given; and `mode`, how the lease holds the lock: `exclusive`, `shared` or
//! `permits` (see [`LockOptions::mode`](crate::LockOptions::mode)), so that the shared holders
//! of a read-write lock and the holders of a semaphore are told apart from exclusive ones.
//! Every event carries the same `mode` field.
//!
//! | metric | kind | when |
//! |--------|------|------|
//! | `lock_acquired_total` | counter | a lease was taken |
//! | `lock_contended_total` | counter | a call found the lock held on its first attempt |
//! | `lock_busy_total` | counter | a call gave up on a busy lock (`Busy`) |
//! | `lock_lost_total` | counter | a held lease was lost |
//! | `lock_max_exec_total` | counter | a body ran past `max_exec` and was cancelled |
//! | `lock_release_failures_total` | counter | a release could not be confirmed |
//! | `lock_wait_seconds` | histogram | from the call to the lease (or to `Busy`) |
//! | `lock_hold_seconds` | histogram | from the acquire to the release (or the loss) |
//! | `lock_renewal_seconds` | histogram | the round trip of each confirmed renewal |
//! | `lock_leases_held` | gauge | leases held by this process now |
//! | `lock_waiters` | gauge | calls of this process waiting for a busy lock now |

use std::time::Duration;

use tokio::time::Instant;

use crate::LostReason;

/// The labels of a call: `lock` (its template if it has one, else its name) and `mode`.
#[derive(Clone, Copy)]
pub(crate) struct Label<'a> {
    pub template: Option<&'static str>,
    pub name: &'a str,
    /// `"exclusive"`, `"shared"` or `"permits"` (see `LockOptions::mode`).
    pub mode: &'static str,
}

impl Label<'_> {
    #[cfg(feature = "metrics")]
    fn value(self) -> metrics::SharedString {
        match self.template {
            Some(t) => metrics::SharedString::const_str(t),
            None => metrics::SharedString::from(self.name.to_owned()),
        }
    }
}

/// Milliseconds since `t`, for an event's field.
fn ms_since(t: Instant) -> u64 {
    t.elapsed().as_millis() as u64
}

/// `begun`: when the acquire began. The clock is read only for a log event or metric that is on,
/// and once for both.
pub(crate) fn acquired(label: Label<'_>, fence: u64, begun: Instant) {
    let waited = std::cell::OnceCell::new();
    let waited = || *waited.get_or_init(|| begun.elapsed());
    tracing::debug!(
        target: "lock_runtime::acquire",
        lock = label.name,
        template = label.template,
        mode = label.mode,
        // None (left out) for a lease taken without a fence.
        fence = (fence != 0).then_some(fence),
        waited_ms = waited().as_millis() as u64,
        "lock acquired"
    );
    #[cfg(feature = "metrics")]
    {
        let lock = label.value();
        metrics::counter!("lock_acquired_total", "lock" => lock.clone(), "mode" => label.mode)
            .increment(1);
        metrics::histogram!("lock_wait_seconds", "lock" => lock.clone(), "mode" => label.mode)
            .record(waited().as_secs_f64());
        metrics::gauge!("lock_leases_held", "lock" => lock, "mode" => label.mode).increment(1.0);
    }
}

pub(crate) fn busy(label: Label<'_>, waited: Duration) {
    // DEBUG: the caller gets `Busy` (a `()` job logs its skip at DEBUG itself).
    tracing::debug!(
        target: "lock_runtime::acquire",
        lock = label.name,
        template = label.template,
        mode = label.mode,
        waited_ms = waited.as_millis() as u64,
        "lock busy: held elsewhere"
    );
    #[cfg(feature = "metrics")]
    {
        let lock = label.value();
        metrics::counter!("lock_busy_total", "lock" => lock.clone(), "mode" => label.mode)
            .increment(1);
        metrics::histogram!("lock_wait_seconds", "lock" => lock, "mode" => label.mode)
            .record(waited.as_secs_f64());
    }
}

/// A call found the lock held on its first attempt.
pub(crate) fn contended(label: Label<'_>) {
    #[cfg(feature = "metrics")]
    metrics::counter!("lock_contended_total", "lock" => label.value(), "mode" => label.mode)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = label;
}

/// A call waiting for a busy lock, counted in `lock_waiters` from [`Waiting::start`] until it
/// is dropped (the call got the lock, gave up, failed or was cancelled).
pub(crate) struct Waiting {
    #[cfg(feature = "metrics")]
    gauge: metrics::Gauge,
}

impl Waiting {
    pub(crate) fn start(label: Label<'_>) -> Self {
        #[cfg(feature = "metrics")]
        {
            let gauge =
                metrics::gauge!("lock_waiters", "lock" => label.value(), "mode" => label.mode);
            gauge.increment(1.0);
            Self { gauge }
        }
        #[cfg(not(feature = "metrics"))]
        {
            let _ = label;
            Self {}
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        self.gauge.decrement(1.0);
    }
}

/// The lease ended (released, dropped or lost); it was taken at `started`.
pub(crate) fn ended(label: Label<'_>, started: Instant) {
    #[cfg(feature = "metrics")]
    {
        let lock = label.value();
        metrics::histogram!("lock_hold_seconds", "lock" => lock.clone(), "mode" => label.mode)
            .record(started.elapsed().as_secs_f64());
        metrics::gauge!("lock_leases_held", "lock" => lock, "mode" => label.mode).decrement(1.0);
    }
    // Without metrics nothing is recorded (not even the clock read).
    #[cfg(not(feature = "metrics"))]
    let _ = (label, started);
}

/// A call with `fail_open` found the servers unreachable (`error`) and runs its body without a
/// lock: one event per call, and the counter of unlocked runs.
pub(crate) fn unlocked_run(label: Label<'_>, error: &dyn std::fmt::Display) {
    tracing::warn!(
        target: "lock_runtime::acquire",
        lock = label.name,
        template = label.template,
        mode = label.mode,
        %error,
        "Redis is unreachable and the lock fails open: the body runs WITHOUT the lock, and \
         others may run it at the same time"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("lock_unlocked_runs_total", "lock" => label.value(), "mode" => label.mode)
        .increment(1);
}

/// A held lease taken at `started` was lost: under a locked call's `body`, which is cancelled,
/// or taken by hand.
pub(crate) fn lost(label: Label<'_>, reason: LostReason, started: Instant, body: bool) {
    let what = if body {
        "lock lost while held; the body is cancelled"
    } else {
        "lock lost while held by a lease taken by hand; nothing is cancelled: its holder learns \
         it from `Lease::lost` or `Lease::is_held`"
    };
    tracing::warn!(
        target: "lock_runtime::hold",
        lock = label.name,
        template = label.template,
        mode = label.mode,
        %reason,
        held_ms = ms_since(started),
        "{what}"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("lock_lost_total", "lock" => label.value(), "mode" => label.mode)
        .increment(1);
}

/// The renewals of `leases` leases (the first of them labelled `label`) failed with `error`,
/// each for the first time in its hold: one event for them all, and none for the retries.
pub(crate) fn renewal_failed(label: Label<'_>, leases: usize, error: &dyn std::fmt::Display) {
    tracing::warn!(
        target: "lock_runtime::hold",
        lock = label.name,
        template = label.template,
        mode = label.mode,
        leases,
        %error,
        "lease renewal failed: the servers could not be reached; retrying while the lease is \
         valid (logged once per hold)"
    );
}

/// The release found the key no longer ours: the body ran to its end, partly without the lock.
pub(crate) fn lost_at_release(label: Label<'_>, started: Instant) {
    tracing::warn!(
        target: "lock_runtime::release",
        lock = label.name,
        template = label.template,
        mode = label.mode,
        held_ms = ms_since(started),
        "the release found the key no longer holding this lease's token (expired, deleted or \
         taken over while the body ran): the body ran partly without the lock"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("lock_lost_total", "lock" => label.value(), "mode" => label.mode)
        .increment(1);
}

pub(crate) fn max_exec(label: Label<'_>, max_exec: Duration) {
    tracing::warn!(
        target: "lock_runtime::hold",
        lock = label.name,
        template = label.template,
        mode = label.mode,
        ?max_exec,
        "the body ran past max_exec and was cancelled"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("lock_max_exec_total", "lock" => label.value(), "mode" => label.mode)
        .increment(1);
}

/// The call that began at `begun` and the time now, when its lease is handed to it: the wait
/// and the start of the hold that [`released`] reports. The clock is read only when that event
/// is on.
pub(crate) fn handed_out(begun: Instant) -> Option<(Instant, Instant)> {
    tracing::enabled!(target: "lock_runtime::release", tracing::Level::INFO)
        .then(|| (begun, Instant::now()))
}

/// The one event of a hold, at its release: how long the call waited for the lock (from the
/// call to the lease), and how long it held it (from `since`).
pub(crate) fn released(label: Label<'_>, fence: u64, waited: Option<Duration>, since: Instant) {
    tracing::info!(
        target: "lock_runtime::release",
        lock = label.name,
        template = label.template,
        mode = label.mode,
        fence = (fence != 0).then_some(fence),
        waited_ms = waited.map(|w| w.as_millis() as u64),
        held_ms = ms_since(since),
        "lock released"
    );
}

pub(crate) fn release_failed(label: Label<'_>, error: &dyn std::fmt::Display, started: Instant) {
    tracing::warn!(
        target: "lock_runtime::release",
        lock = label.name,
        template = label.template,
        mode = label.mode,
        %error,
        held_ms = ms_since(started),
        "release failed; unless the release reached the server after all, the key stays until \
         its ttl runs out"
    );
    #[cfg(feature = "metrics")]
    metrics::counter!("lock_release_failures_total", "lock" => label.value(), "mode" => label.mode)
        .increment(1);
}

pub(crate) fn renewed(label: Label<'_>, round_trip: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("lock_renewal_seconds", "lock" => label.value(), "mode" => label.mode)
        .record(round_trip.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (label, round_trip);
}
