//! The body of a locked call, raced against its deadline and the loss of its lease.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::Instant;

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
    let outcome = {
        let deadline = Instant::now() + max_exec;
        let mut status = lease.status();
        let mut body = std::pin::pin!(CatchUnwind {
            inner: body(&lease),
        });
        loop {
            let now = status.borrow_and_update().to_owned();
            if let Some(reason) = now.lost {
                break Outcome::Lost(reason);
            }
            // The clock first: a body resumed after a pause must not take one more step past
            // its bounds before the timers get polled.
            if let Some(out) = past_bounds(deadline, now.valid_until) {
                break out;
            }
            tokio::select! {
                biased;
                () = tokio::time::sleep_until(deadline.min(now.valid_until)) => {}
                _ = status.changed() => {}
                done = &mut body => break match done {
                    Err(panic) => Outcome::Panicked(panic),
                    // A body that finished after its lease ran out ran (partly) without the
                    // lock: report the loss rather than a success.
                    Ok(_) if status.borrow().lost.is_some() => {
                        Outcome::Lost(status.borrow().lost.unwrap_or(LostReason::NotOwner))
                    }
                    Ok(_) if status.borrow().valid_until <= Instant::now() => {
                        Outcome::Lost(LostReason::ValidityExpired)
                    }
                    Ok(v) => Outcome::Done(v),
                },
            }
        }
        // The body (and its borrow of the lease) is dropped here: cancelled if it did not finish.
    };
    let name = lease.name().to_owned();
    if let Outcome::Lost(reason) = outcome {
        // Counted and logged once, however it was found out.
        lease.state.mark_lost(reason);
        // The key is gone or out of reach: release in the background (the lease's drop) rather
        // than make the caller wait on a node that may not answer.
        drop(lease);
        return Err(LockError::Lost { name, reason });
    }
    if let Outcome::MaxExec = outcome {
        crate::observe::max_exec(lease.state.label(), max_exec);
    }
    // A failed release is logged and counted by the lease; the body's value stands.
    let _ = lease.release().await;
    match outcome {
        Outcome::Done(v) => Ok(v),
        Outcome::Panicked(panic) => resume_unwind(panic),
        Outcome::MaxExec => Err(LockError::MaxExecExceeded { name, max_exec }),
        Outcome::Lost(reason) => unreachable!("returned above: {reason}"),
    }
}

/// Which bound has passed, if any; when both have, the one that came first decides.
fn past_bounds<T>(deadline: Instant, valid_until: Instant) -> Option<Outcome<T>> {
    let now = Instant::now();
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
    struct CatchUnwind<F> {
        #[pin]
        inner: F,
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
