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
    let max_exec = opts.max_exec_or_default();
    let outcome = {
        let deadline = Instant::now() + max_exec;
        let mut status = lease.status();
        let mut body = std::pin::pin!(CatchUnwind(body(&lease)));
        loop {
            let now = status.borrow_and_update().to_owned();
            if let Some(reason) = now.lost {
                break Outcome::Lost(reason);
            }
            let wake = deadline.min(now.valid_until);
            tokio::select! {
                biased;
                done = &mut body => break match done {
                    Ok(v) => Outcome::Done(v),
                    Err(panic) => Outcome::Panicked(panic),
                },
                () = tokio::time::sleep_until(wake) => {
                    // Whichever bound came first decides (both may have passed by now).
                    let valid_until = status.borrow().valid_until;
                    let now = Instant::now();
                    if valid_until <= now && valid_until <= deadline {
                        break Outcome::Lost(LostReason::ValidityExpired);
                    }
                    if now >= deadline {
                        break Outcome::MaxExec;
                    }
                }
                _ = status.changed() => {}
            }
        }
        // The body (and its borrow of the lease) is dropped here: cancelled if it did not finish.
    };
    let name = lease.name().to_owned();
    if let Outcome::Lost(reason) = outcome {
        // The key is gone or out of reach: release in the background (the lease's drop) rather
        // than make the caller wait on a node that may not answer.
        drop(lease);
        return Err(LockError::Lost { name, reason });
    }
    let released = lease.release().await;
    match outcome {
        Outcome::Done(v) => {
            if let Err(e) = released {
                tracing::warn!(lock = %name, error = %e, "the body finished but the release failed; the key expires by its ttl");
            }
            Ok(v)
        }
        Outcome::Panicked(panic) => resume_unwind(panic),
        Outcome::MaxExec => Err(LockError::MaxExecExceeded { name, max_exec }),
        Outcome::Lost(reason) => unreachable!("returned above: {reason}"),
    }
}

/// Catches a panic of the inner future so that the lock is released before it is resumed.
struct CatchUnwind<F>(F);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, Box<dyn Any + Send>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: structural pinning of the only field; it is never moved out.
        let inner = unsafe { self.map_unchecked_mut(|s| &mut s.0) };
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}
