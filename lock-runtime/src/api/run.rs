//! The body of a locked call, raced against its deadline and the loss of its lease.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::Instant;

use crate::state::lease_state::LeaseState;
use crate::state::status::Status;
use crate::{Lease, LockError, LockOptions, LostReason};

enum Outcome<T> {
    Done(T),
    Panicked(Box<dyn Any + Send>),
    MaxExec,
    Lost(LostReason),
}

/// Runs `body` while `lease` is held, then releases it on every path.
pub(crate) async fn run_body<T, F>(
    lease: Lease,
    opts: &LockOptions,
    body: F,
) -> Result<T, LockError>
where
    F: AsyncFnOnce(&Lease) -> T,
{
    let max_exec = opts.max_exec();
    // From here a loss cancels a body: the loss is logged so.
    lease
        .state
        .runs_body
        .store(true, std::sync::atomic::Ordering::Release);
    let outcome = {
        // One clock read serves the deadline and the check before the first poll.
        let now = Instant::now();
        let deadline = now + max_exec;
        let mut body = std::pin::pin!(CatchUnwind {
            inner: body(&lease),
        });
        // The first poll needs neither the deadline timer nor the loss watch (the bounds are
        // checked just before it): a body that finishes without waiting costs neither.
        match must_end(now, deadline, lease.state.status.get()) {
            Some(out) => out,
            None => match std::future::poll_fn(|cx| Poll::Ready(body.as_mut().poll(cx))).await {
                Poll::Ready(done) => finished(done, &lease, deadline),
                Poll::Pending => race(&mut body, deadline, &lease).await,
            },
        }
        // The body (and its borrow of the lease) is dropped here: cancelled if it did not finish.
    };
    let outcome = unreachable_instead(outcome, &lease.state);
    if let Outcome::Lost(reason) = outcome {
        // Counted and logged once, however it was found out.
        lease.state.mark_lost(reason);
        let error = lease.state.lost_error(reason);
        // The key is gone or out of reach: release in the background (the lease's drop) rather
        // than make the caller wait on a node that may not answer.
        drop(lease);
        return Err(error);
    }
    // Made before the release consumes the lease; the name is copied for an error only.
    let max_exec_error = matches!(outcome, Outcome::MaxExec).then(|| {
        crate::plumbing::telemetry::max_exec(lease.state.label(), max_exec);
        LockError::MaxExecExceeded {
            name: lease.name().to_owned(),
            max_exec,
        }
    });
    // A key found no longer ours means the body ran partly without the lock: the caller must
    // know. Any other failed release is logged and counted by the lease; the body's value
    // stands (the key expires by its ttl).
    let released = lease.release().await;
    if let Some(error) = max_exec_error {
        return Err(error);
    }
    match (outcome, released) {
        (Outcome::Panicked(panic), _) => resume_unwind(panic),
        (Outcome::Done(_), Err(lost @ LockError::Lost { .. })) => Err(lost),
        (Outcome::Done(v), _) => Ok(v),
        (Outcome::MaxExec | Outcome::Lost(_), _) => unreachable!("returned above"),
    }
}

/// A bound that passed while the renewals since the last confirmed one failed with server
/// errors: what the caller must hear is that the servers could not be reached (not a slow body,
/// nor only that the validity ran out).
fn unreachable_instead<T>(outcome: Outcome<T>, state: &LeaseState) -> Outcome<T> {
    match outcome {
        Outcome::MaxExec | Outcome::Lost(LostReason::ValidityExpired)
            if state.expired_reason() == LostReason::Unreachable =>
        {
            Outcome::Lost(LostReason::Unreachable)
        }
        other => other,
    }
}

/// Polls `body` until it finishes, raced against the deadline and the loss of `lease`.
async fn race<T, F>(
    body: &mut Pin<&mut CatchUnwind<F>>,
    deadline: Instant,
    lease: &Lease,
) -> Outcome<T>
where
    F: Future<Output = T>,
{
    let mut status = lease.status();
    loop {
        let current = status.borrow_and_update();
        // The clock first: a body resumed after a pause must not take one more step past its
        // bounds. Checked here, on every turn, the bounds need no timer to be polled before the
        // body.
        if let Some(out) = must_end(Instant::now(), deadline, current) {
            return out;
        }
        tokio::select! {
            biased;
            done = body.as_mut() => return finished(done, lease, deadline),
            () = tokio::time::sleep_until(deadline.min(current.valid_until)) => {}
            () = status.changed() => {}
        }
    }
}

/// What a body that finished means: a body that finished after its lease was lost or ran out,
/// or past `max_exec` (it blocked its thread, so nothing could cancel it in time), is reported as
/// such rather than with its value.
fn finished<T>(
    done: Result<T, Box<dyn Any + Send>>,
    lease: &Lease,
    deadline: Instant,
) -> Outcome<T> {
    match done {
        Err(panic) => Outcome::Panicked(panic),
        Ok(v) => {
            must_end(Instant::now(), deadline, lease.state.status.get()).unwrap_or(Outcome::Done(v))
        }
    }
}

/// Why the body must end now, if it must: the lease was lost, or a bound has passed.
/// `now` is read by the caller, right before the poll it guards.
fn must_end<T>(now: Instant, deadline: Instant, status: Status) -> Option<Outcome<T>> {
    match status.lost {
        Some(reason) => Some(Outcome::Lost(reason)),
        None => past_bounds(now, deadline, status.valid_until),
    }
}

/// Which bound has passed, if any; when both have, the one that came first decides.
fn past_bounds<T>(now: Instant, deadline: Instant, valid_until: Instant) -> Option<Outcome<T>> {
    if valid_until <= now && valid_until <= deadline {
        Some(Outcome::Lost(LostReason::ValidityExpired))
    } else if now >= deadline {
        Some(Outcome::MaxExec)
    } else {
        None
    }
}

pin_project_lite::pin_project! {
    /// Catches a panic of the inner future so that the lock is released before it is resumed.
    pub(crate) struct CatchUnwind<F> {
        #[pin]
        inner: F,
    }
}

impl<F> CatchUnwind<F> {
    pub(crate) fn new(inner: F) -> Self {
        Self { inner }
    }
}

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.project().inner;
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}
